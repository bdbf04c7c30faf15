"""The reference overlap engine: the system of the seed article, compact and faithful."""
