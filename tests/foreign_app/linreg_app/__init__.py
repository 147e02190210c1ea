"""A stranger's Flower app used to check that bouquet's strategies drop in."""
