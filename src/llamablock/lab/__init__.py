"""The lab: each claim of the module measured by this project's own code (`llamablock lab`)."""
