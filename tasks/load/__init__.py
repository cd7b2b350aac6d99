"""The load generator: requests sent, streams parsed, its own noise measured."""
