"""Front-ends: model files and modules -> the IR. ``aten/`` lowers a ``torch.nn`` module
captured by ``torch.export`` (PyTorch's core ATen ops); ``onnx/`` runs an ONNX graph's nodes
as a module for ``aten/``; ``programs.py`` reads ``.pt2`` and ``.pt`` files through torch's
ONNX exporter, so every format shares one importer."""
