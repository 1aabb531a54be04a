"""npu-sim's tests: the emulator runs in child processes (npusim_ranks), never in the pytest process."""
