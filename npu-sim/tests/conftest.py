"""npu-sim's tests: the emulator runs in child processes (npu_sim.testing), never in the pytest process."""
