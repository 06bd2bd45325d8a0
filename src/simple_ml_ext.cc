// hw0's C++ softmax-regression epoch, exposed to Python as needle.apps.simple_ml_ext.
//
// softmax_regression_epoch_cpp(X, y, theta, lr, batch) runs one epoch of mini-batch SGD on the
// softmax (cross-entropy) loss and updates theta in place. It does exactly what the numpy
// softmax_regression_epoch does: batches in order, the last one possibly smaller, each gradient
// X_b^T (softmax(X_b theta) - I_y) / b averaged over the b rows of that batch.
//
// All checking happens in the binding, before any pointer is touched: wrong dtypes, shapes,
// a non-contiguous or read-only theta, a label >= k or a non-positive batch raise Python
// exceptions that name the argument.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace py = pybind11;

/// One epoch of softmax regression. X: m x n row-major, y: m labels in [0, k),
/// theta: n x k row-major (updated in place), batch: rows per step.
// question: hw0_softmax_regression_epoch_cpp
void softmax_regression_epoch_cpp(const float *X, const unsigned char *y, float *theta,
                                  size_t m, size_t n, size_t k, float lr, size_t batch) {
  std::vector<float> Z(batch * k);
  std::vector<float> grad(n * k);
  for (size_t start = 0; start < m; start += batch) {
    const size_t b = std::min(batch, m - start);
    const float *Xb = X + start * n;
    // Z = softmax(Xb theta) - I_y, row by row (the max is subtracted for stability).
    for (size_t i = 0; i < b; ++i) {
      float *z = &Z[i * k];
      std::fill(z, z + k, 0.0f);
      for (size_t j = 0; j < n; ++j) {
        const float x = Xb[i * n + j];
        if (x == 0.0f) continue;  // most pixels are blank: skipping them changes no sum
        const float *t = theta + j * k;
        for (size_t c = 0; c < k; ++c) z[c] += x * t[c];
      }
      const float zmax = *std::max_element(z, z + k);
      float total = 0.0f;
      for (size_t c = 0; c < k; ++c) {
        z[c] = std::exp(z[c] - zmax);
        total += z[c];
      }
      for (size_t c = 0; c < k; ++c) z[c] /= total;
      z[y[start + i]] -= 1.0f;
    }
    // grad = Xb^T Z / b; theta -= lr * grad
    std::fill(grad.begin(), grad.end(), 0.0f);
    for (size_t i = 0; i < b; ++i) {
      const float *z = &Z[i * k];
      for (size_t j = 0; j < n; ++j) {
        const float x = Xb[i * n + j];
        if (x == 0.0f) continue;
        float *g = &grad[j * k];
        for (size_t c = 0; c < k; ++c) g[c] += x * z[c];
      }
    }
    const float scale = lr / static_cast<float>(b);
    for (size_t idx = 0; idx < n * k; ++idx) theta[idx] -= scale * grad[idx];
  }
}

namespace {

std::string shape_str(const py::array &a) {
  std::ostringstream out;
  out << "(";
  for (py::ssize_t d = 0; d < a.ndim(); ++d) out << (d ? ", " : "") << a.shape(d);
  out << (a.ndim() == 1 ? ",)" : ")");
  return out.str();
}

std::string dtype_str(const py::array &a) { return py::str(a.dtype()).cast<std::string>(); }

void require_float32(const py::array &a, const char *name) {
  if (!a.dtype().is(py::dtype::of<float>()))
    throw py::type_error(std::string(name) + " must be a float32 array, got dtype " +
                         dtype_str(a) + " (convert with .astype(np.float32))");
}

bool c_contiguous(const py::array &a) {
  return (a.flags() & py::array::c_style) != 0;
}

}  // namespace

PYBIND11_MODULE(simple_ml_ext, m) {
  m.doc() = "hw0's softmax-regression epoch in C++ (needle.apps.simple_ml_ext)";
  m.def(
      "softmax_regression_epoch_cpp",
      [](py::array X, py::array y, py::array theta, float lr, long long batch) {
        require_float32(X, "X");
        require_float32(theta, "theta");
        if (X.ndim() != 2) throw py::value_error("X must be 2-D (m, n), got shape " + shape_str(X));
        if (theta.ndim() != 2)
          throw py::value_error("theta must be 2-D (n, k), got shape " + shape_str(theta));
        if (y.ndim() != 1) throw py::value_error("y must be 1-D (m,), got shape " + shape_str(y));
        const size_t mm = X.shape(0), n = X.shape(1), k = theta.shape(1);
        if (static_cast<size_t>(y.shape(0)) != mm)
          throw py::value_error("X has " + std::to_string(mm) + " rows but y has " +
                                std::to_string(y.shape(0)) + " labels");
        if (static_cast<size_t>(theta.shape(0)) != n)
          throw py::value_error("theta must have X.shape[1] = " + std::to_string(n) +
                                " rows, got shape " + shape_str(theta));
        if (k == 0) throw py::value_error("theta must have at least one column (class)");
        if (!c_contiguous(theta) || !theta.writeable())
          throw py::value_error("theta must be a C-contiguous, writeable array: it is updated in place");
        if (batch <= 0) throw py::value_error("batch must be positive, got " + std::to_string(batch));
        if (!std::isfinite(lr)) throw py::value_error("lr must be finite");
        const char kind = y.dtype().kind();
        if (kind != 'u' && kind != 'i')
          throw py::type_error("y must hold integer labels, got dtype " + dtype_str(y));
        // Labels are read only: other integer dtypes are copied to uint8 after a range check.
        auto labels = py::array_t<long long, py::array::c_style | py::array::forcecast>(y);
        const long long *lab = labels.data();
        for (size_t i = 0; i < mm; ++i)
          if (lab[i] < 0 || static_cast<size_t>(lab[i]) >= k || lab[i] > 255)
            throw py::value_error("label y[" + std::to_string(i) + "] = " + std::to_string(lab[i]) +
                                  " is outside [0, " + std::to_string(std::min<size_t>(k, 256)) + ")");
        std::vector<unsigned char> y8(lab, lab + mm);
        auto Xc = py::array_t<float, py::array::c_style>::ensure(X);  // a copy only if strided
        const float *xp = Xc.data();
        float *tp = static_cast<float *>(theta.mutable_data());
        {
          py::gil_scoped_release release;
          softmax_regression_epoch_cpp(xp, y8.data(), tp, mm, n, k, lr,
                                       std::min<size_t>(static_cast<size_t>(batch), std::max<size_t>(mm, 1)));
        }
      },
      py::arg("X"), py::arg("y"), py::arg("theta"), py::arg("lr"), py::arg("batch"),
      "One epoch of softmax regression on X (m, n) float32 and y (m,) integer labels, updating\n"
      "theta (n, k) float32 in place with mini-batches of `batch` rows and step size `lr`.");
}
