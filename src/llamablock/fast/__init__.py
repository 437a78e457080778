"""Fast engines: the same model transformed (fused weights, static cache, quantized layers, compiled)."""
