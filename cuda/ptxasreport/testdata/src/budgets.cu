// The budget lines of mla_decode.cu, as that file writes them.
KC_SMEM_FITS(1, 2, 101376);
KC_SMEM_FITS(4, 2, 166912);
KC_SMEM_FITS(4, 3, 232448);
