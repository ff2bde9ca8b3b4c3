"""pflash-proxy: a transparent reverse proxy for llama.cpp's llama-server that makes long prompts cheap."""

__version__ = "0.1.0"
