"""The servers this project starts (`cupid serve`): serve profiles and their vLLM arguments, the engines, a server's
life (up, down, status, its records, ports, probes, logs and watchdog), the instant test server and the tiny model.
The client side (`serving.client`, `serving.registry`, `serving.endpoint`, `serving.cache`) never imports this package:
what it must know of these servers (the ones running, how to start one) is handed to it (`lifecycle.live_endpoints`,
`profiles.start_hint`)."""
