"""Front-ends: model files and modules -> the IR. ``torch_fx.py`` lowers a ``torch.nn`` module
through ``torch.fx``, ``aten/`` through ``torch.export``; ``onnx/`` runs an ONNX graph's nodes
as a module for ``aten/``; ``programs.py`` reads
``.pt2`` and ``.pt`` files through torch's ONNX exporter, so every format shares one importer."""
