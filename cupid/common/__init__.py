"""What every layer shares and none owns: reading and validating configuration (`config`), the project's errors
(`errors`), running async code from blocking code (`aio`), a run directory's soundness (one writer, atomic writes:
`files`), whether the Hugging Face Hub answers (`hub`) and the one-off HTTP requests, on one TLS context (`tls`).
It imports nothing else of the project."""
