"""The 23 roles, the Skeleton (mapped chain, offsets, masks) and bone maps with auto-mapping."""
