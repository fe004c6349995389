"""What every layer shares and none owns: reading and validating configuration (`config`), the project's errors
(`errors`), running async code from blocking code (`aio`), a run directory's soundness (one writer, atomic writes:
`files`) and whether the Hugging Face Hub answers (`hub`). It imports nothing else of the project."""
