"""Post-processors and how they train: the networks that turn a raw ensemble into a calibrated
Gaussian forecast, their loss and head, the LightningModule, fused kernels and training plugins.

Modules: ``postprocessors`` (EMOS, MLP), ``convnets`` (LeNet-style, U-Net), ``smoe`` (Spatial
Mixture-of-Experts), ``transformer`` (ensemble Transformer), ``losses`` (the spread-relative head and
the CRPS loss), ``module`` (the LightningModule and self-describing checkpoints); subpackages
``kernels`` (Triton / PyTorch kernels behind one dispatch) and ``plugins`` (sparsity and distributed
optimizers). See docs/models.md, docs/kernels.md and docs/plugins.md.
"""
