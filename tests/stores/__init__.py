"""Tests of the stores: the contract on every store, the differential test, each
database's paths and routines."""
