"""The Tile IR: per launch, an explicit tile program that every backend prints."""
