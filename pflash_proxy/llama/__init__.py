"""llama-server's side: the HTTP client of the proxy's own calls (``upstream``), the spawned and supervised
server (``spawn``), and which optional extra brings what (``extras``)."""
