"""A stranger's torch Flower app used to check that bouquet's SCKM selection drops in."""
