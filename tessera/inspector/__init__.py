"""The lowering inspector: the stages of a program side by side, as one HTML page."""

from .page import inspector_page, page_data

__all__ = ["inspector_page", "page_data"]
