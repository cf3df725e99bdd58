"""Tests of the code alone: the layers, the suite's habits, the public API's names."""
