"""What only the chapters use: code display, the simulation, review figures."""
