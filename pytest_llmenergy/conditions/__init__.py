"""The conditions a trial runs under: the GPU setting applied and restored, the GPUs'
temperature before it, what they did during it and who else was on them; all read and
changed through the vendor layer, ``gpu/``."""
