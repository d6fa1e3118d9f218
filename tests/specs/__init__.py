"""Tests of autopar.specs: the hardware zoo, bad input files and the layout rules."""
