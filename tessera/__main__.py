"""``python -m tessera`` runs ``tesserac``."""

from .cli import command

command()
