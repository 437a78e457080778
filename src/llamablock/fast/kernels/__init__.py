"""The weight formats' layers and the kernels under them: PyTorch's packed int8/int4
layers, the K-quant repacking, the file's own GGUF blocks and the C kernel that computes them, and the
loader that reads a checkpoint into them. Nothing here knows about compiled programs (fast/compiled/)."""
