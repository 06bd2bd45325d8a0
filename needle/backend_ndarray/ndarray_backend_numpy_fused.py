"""The numpy reference device module's fused kernels (see protocol.py), over its Array buffers."""
