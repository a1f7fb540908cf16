/* Float byte-plane codec: PLACEHOLDER until implemented (returns unsupported). */
#include "codec_internal.h"
size_t ft_bp_bound(const ft_frame_info *fi, size_t raw_bytes) { (void)fi; return raw_bytes + 64; }
ft_status ft_bp_encode_chunk(ft_worker_ws *ws, const ft_frame_info *fi, const void *src, size_t raw_bytes,
                             void *dst, size_t cap, size_t *out)
{ (void)ws; (void)fi; (void)src; (void)raw_bytes; (void)dst; (void)cap; (void)out;
  return ft_set_error(FT_ERR_UNSUPPORTED, "byteplane not implemented yet"); }
ft_status ft_bp_decode_chunk(ft_worker_ws *ws, const ft_frame_info *fi, const void *src, size_t n,
                             void *dst, size_t raw_bytes)
{ (void)ws; (void)fi; (void)src; (void)n; (void)dst; (void)raw_bytes;
  return ft_set_error(FT_ERR_UNSUPPORTED, "byteplane not implemented yet"); }
