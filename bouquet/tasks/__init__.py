"""Models and local training/evaluation per use case (torch)."""
