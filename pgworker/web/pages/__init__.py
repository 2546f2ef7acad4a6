"""The console\x27s pages, one module each: its data function and its routes."""
