// Anchor for the shared precompiled header (see AmppTargets.cmake).
