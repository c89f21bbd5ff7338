"""Front-ends: model files and modules -> the IR. ``torch_fx.py`` lowers a ``torch.nn`` module
through ``torch.fx``; ``onnx/`` rebuilds an ONNX graph as a module; ``programs.py`` reads
``.pt2`` and ``.pt`` files through torch's ONNX exporter, so every format shares one importer."""
