"""Cost: tier prices, cost reports, forecasts, sizing, and early-deletion awareness."""
