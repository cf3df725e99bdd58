"""Tests of real workers, servers of their own cut or killed, and many starters at once."""
