"""The compiled engines: the static-cache model, the AOTInductor programs built from it and
their packages, builds index, options, caches and huge pages. They run the layers of fast/kernels/."""
