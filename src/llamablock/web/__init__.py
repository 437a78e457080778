"""The interactive page of the module's five figures (`llamablock serve`).

A thin face over the library (STYLE.md, "faces"): each API module parses and bounds its
query parameters, calls llamablock, and returns JSON; the page in static/ only draws what the
API returns. Nothing here re-derives maths that the library has.
"""
