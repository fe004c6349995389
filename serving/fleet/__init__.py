"""The servers a run or a night brings as one model: the GPUs and their memory plan (gpu_memory.py), where each
server goes (placement.py), each server started on first need and restarted once (on_demand.py), and the whole of them
(run_servers.py)."""
