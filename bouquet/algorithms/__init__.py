"""The papers' math as pure numpy functions (no flwr import)."""
