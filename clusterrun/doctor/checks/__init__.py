"""Doctor checks; importing this package registers all of them."""
