"""Benchmarks: they print numbers, and may import any part of ragrank, the server included."""
