// Operator schemas of the dgl_exact extension (torch.ops.dgl_exact.*).
//
// Layout (like torchvision's csrc/ops): this file declares the schemas; *_cpu.cpp register the CPU kernels,
// *_cuda.cu the CUDA kernels. Fake (meta) implementations for torch.compile are registered from Python
// (dgl_exact/kernels/extension.py) with torch.library.register_fake. Semantics: reference.py; the list
// of ops with their schemas: dgl_exact/kernels/spec.py (tests check the two agree).
#include <Python.h>
#include <torch/library.h>

#include "dgl_exact.h"

TORCH_LIBRARY(dgl_exact, m) {
  m.def("group_meta(Tensor mn, Tensor mx, int bits) -> Tensor");
  m.def("quantize_pack(Tensor x, Tensor lo, Tensor step, Tensor? levels, int bits, int block_rows, int seed, "
        "bool stochastic) -> Tensor");
  m.def("unpack_dequantize(Tensor packed, Tensor lo, Tensor step, Tensor? levels, int bits, int block_rows, "
        "int n_rows, int k, ScalarType dtype) -> Tensor");
  m.def("compress_rows(Tensor x, Tensor? levels, int bits, int block_rows, int seed, bool stochastic) "
        "-> (Tensor, Tensor)");
  m.def("relu_dropout_compress(Tensor x, float p, int seed, Tensor? levels, int bits, int block_rows, "
        "int code_seed, bool stochastic) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("pack_mask(Tensor mask) -> Tensor");
  m.def("unpack_mask(Tensor packed, int numel) -> Tensor");
  m.def("dropout(Tensor x, float p, int seed) -> Tensor");
  m.def("relu_dropout(Tensor x, float p, int seed) -> (Tensor, Tensor)");
  m.def("masked_scale(Tensor g, Tensor packed, float on, float off) -> Tensor");
  m.def("rademacher_(Tensor(a!) out, int seed) -> ()");
  m.def("spmm_sum(Tensor indptr, Tensor indices, Tensor? eids, Tensor x, Tensor? w, int n_dst) -> Tensor");
  m.def("spmm_minmax(Tensor indptr, Tensor indices, Tensor? eids, Tensor x, str reduce, int n_dst) "
        "-> (Tensor, Tensor)");
  m.def("sddmm_dot(Tensor indptr, Tensor indices, Tensor? eids, Tensor a, Tensor b) -> Tensor");
}

// `import dgl_exact._C` (the setup.py build) only needs a module object: loading the library runs the
// registrations above. JIT builds load the same code with torch.ops.load_library instead.
extern "C" {
PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", "dgl_exact compiled kernels (torch.ops.dgl_exact)",
                                          -1, nullptr};
  return PyModule_Create(&module_def);
}
}
