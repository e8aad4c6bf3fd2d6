"""The Schedule IR: per kernel, how its work is tiled and launched."""
