"""What counts as a *use* of a parameter, shared by both capture paths."""

from __future__ import annotations

__all__ = ["METADATA_METHODS"]

# Torch calls that read a parameter's metadata, not its values. They are not
# uses: FSDP need not all-gather a parameter to answer ``w.shape`` or
# ``w.size(0)``, and wrappers such as FSDP1 call some of them on parameters
# while unsharding. Symbolic and runtime capture must agree on this set, or
# their orders differ on models that read metadata.
METADATA_METHODS = frozenset(
    {
        "size",
        "dim",
        "ndimension",
        "numel",
        "nelement",
        "stride",
        "storage_offset",
        "element_size",
        "is_floating_point",
        "is_complex",
        "is_contiguous",
        "data_ptr",
        "untyped_storage",
        "_typed_storage",
        "get_device",
        "__len__",
        "__hash__",
        "__eq__",
        "__format__",
        "__repr__",
        "__reduce_ex__",
        "_is_view",
        "is_set_to",
    }
)
