/* Group quantization: PLACEHOLDER until implemented (returns unsupported). */
#include "codec_internal.h"
size_t ft_quant_chunk_size(const ft_frame_info *fi, const ft_layout *L, uint64_t off, uint64_t cnt)
{ (void)fi; (void)L; (void)off; return (size_t)cnt * 2 + 64; }
ft_status ft_quant_encode_chunk(const ft_frame_info *fi, const ft_layout *L, uint64_t off, uint64_t cnt,
                                const void *src, void *dst, size_t cap, size_t *out)
{ (void)fi; (void)L; (void)off; (void)cnt; (void)src; (void)dst; (void)cap; (void)out;
  return ft_set_error(FT_ERR_UNSUPPORTED, "quantization not implemented yet"); }
ft_status ft_quant_decode_chunk(const ft_frame_info *fi, const ft_layout *L, uint64_t off, uint64_t cnt,
                                const void *src, size_t n, ft_dtype out_dt, void *dst)
{ (void)fi; (void)L; (void)off; (void)cnt; (void)src; (void)n; (void)out_dt; (void)dst;
  return ft_set_error(FT_ERR_UNSUPPORTED, "quantization not implemented yet"); }
