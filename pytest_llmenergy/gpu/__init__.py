"""GPUs, whatever their vendor: the one layer that knows pynvml, amdsmi and the others
(``device.py``: the interface and the ``VENDORS`` registry; one module per vendor)."""
