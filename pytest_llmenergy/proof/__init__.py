"""``llmenergy proof``: the package against a real GPU, in one prepared command.

A GPU box may be at hand for minutes, without a network: the proof runs from the
checkout, in a time budget, and writes what it found (``proof.md``, ``proof.json``,
the saved runs) after every stage.  Its stages:

- ``meter_probe``: NVML's energy counter against the integral of the power readings
  (the 1 s average and the instantaneous field) on the same windows, at idle and under
  load; the counter's update period and the average's window, as measured;
- ``stages``: the suite on a random-weight Llama-3.1-8B in bf16 at batch 1, 8 and 64
  beside ML.ENERGY's published figures; a power-limit frontier with the state read back;
  a paired A/A and a +10 % regression through ``llmenergy ab``; counted work on the GPU
  against the CPU's count.

Against the stand-ins (tests/fakes/hopper.py) the same command runs in the test suite,
smaller (``--plan smoke``), so that the day a GPU is at hand it works the first time.
"""
