// The CPU module's `Array` as a plain CPython type holding an AlignedArray inline, and the
// pybind11 caster that hands it to the kernels as `const AlignedArray&` / `AlignedArray*`.
//
// Why not py::class_<AlignedArray>: every NDArray operation allocates its result, and
// pybind11's class machinery (the __init__ dispatch, its registry of live instances) made
// `Array(64)` cost ~0.34 us here against ~0.05 us for a call to a kernel that does nothing:
// a quarter of a small `a + b`. This type's constructor and destructor do only the
// allocation. Its Python surface is the one the class had: Array(size) (ValueError when size
// is negative or too large, TypeError when it is not an integer), .size, .ptr().
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

#include <new>
#include <stdexcept>

#include "cpu/ndarray_backend_cpu_alloc.h"

namespace needle::cpu {

struct ArrayObject {
  PyObject_HEAD
  AlignedArray array;  // constructed in place by array_of_size, destroyed by array_dealloc
};

// A new Array of `size` elements, an int or an object with __index__ (or nullptr with the
// Python error set: TypeError for other kinds, ValueError for a negative or too large size).
inline PyObject* array_of_size(PyTypeObject* type, PyObject* size_object) {
  PyObject* index = PyNumber_Index(size_object);
  if (!index) return nullptr;
  int overflow = 0;
  const long long size = PyLong_AsLongLongAndOverflow(index, &overflow);
  Py_DECREF(index);
  if (size == -1 && PyErr_Occurred()) return nullptr;
  if (overflow) {
    PyErr_Format(PyExc_ValueError, "Array size %S is too large", size_object);
    return nullptr;
  }
  PyObject* self = type->tp_alloc(type, 0);
  if (!self) return nullptr;
  try {
    new (&reinterpret_cast<ArrayObject*>(self)->array) AlignedArray(static_cast<int64_t>(size));
  } catch (const std::invalid_argument& e) {
    Py_TYPE(self)->tp_free(self);  // the array was not constructed: free without its destructor
    PyErr_SetString(PyExc_ValueError, e.what());
    return nullptr;
  } catch (const std::bad_alloc&) {
    Py_TYPE(self)->tp_free(self);
    PyErr_NoMemory();
    return nullptr;
  }
  return self;
}

inline PyObject* array_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  static const char* keywords[] = {"size", nullptr};
  PyObject* size = nullptr;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:Array", const_cast<char**>(keywords), &size))
    return nullptr;
  return array_of_size(type, size);
}

// Array(n) or Array(size=n), the call every NDArray result makes, without the argument tuple
// and dict that tp_new takes.
inline PyObject* array_vectorcall(PyObject* type, PyObject* const* args, size_t nargsf,
                                  PyObject* kwnames) {
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  const Py_ssize_t given = nargs + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
  if (given == 1 &&
      (nargs == 1 || PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "size") == 0))
    return array_of_size(reinterpret_cast<PyTypeObject*>(type), args[0]);
  PyErr_SetString(PyExc_TypeError, "Array() takes one argument, size");
  return nullptr;
}

inline void array_dealloc(PyObject* self) {
  reinterpret_cast<ArrayObject*>(self)->array.~AlignedArray();
  Py_TYPE(self)->tp_free(self);
}

inline PyObject* array_ptr(PyObject* self, PyObject*) {
  return PyLong_FromUnsignedLongLong(reinterpret_cast<ArrayObject*>(self)->array.ptr_as_int());
}

inline PyObject* array_size(PyObject* self, void*) {
  return PyLong_FromLongLong(reinterpret_cast<ArrayObject*>(self)->array.size);
}

inline PyMethodDef array_methods[] = {
    {"ptr", array_ptr, METH_NOARGS, "Address of the first element."},
    {nullptr, nullptr, 0, nullptr},
};

inline PyGetSetDef array_getset[] = {
    {"size", array_size, nullptr, "Number of float32 elements.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

// The type object (one per loaded module: a buffer of one CPU module is not another's).
inline PyTypeObject& array_type() {
  static PyTypeObject type = [] {
    PyTypeObject t{};  // zero: PyType_Ready fills in the rest
    Py_SET_REFCNT(reinterpret_cast<PyObject*>(&t), 1);  // never freed: the module holds it
    t.tp_name = "needle.backend_ndarray.ndarray_backend_cpu.Array";  // where the package puts it
    t.tp_basicsize = sizeof(ArrayObject);
    t.tp_dealloc = array_dealloc;
    t.tp_flags = Py_TPFLAGS_DEFAULT;
    t.tp_doc = "Array(size)\n\nA flat float32 buffer of `size` elements (uninitialised).";
    t.tp_methods = array_methods;
    t.tp_getset = array_getset;
    t.tp_new = array_new;
    t.tp_vectorcall = array_vectorcall;
    return t;
  }();
  return type;
}

// Adds the type to module `m` as `Array` (PyType_Ready first; throws on failure).
inline void add_array_type(pybind11::module_& m) {
  PyTypeObject& type = array_type();
  if (PyType_Ready(&type) < 0) throw pybind11::error_already_set();
  m.attr("Array") = pybind11::handle(reinterpret_cast<PyObject*>(&type));
}

}  // namespace needle::cpu

namespace pybind11::detail {
// Loads an `Array` argument as the AlignedArray it holds; anything else (None included) does
// not match, so pybind11 raises its TypeError naming the expected signature.
template <>
class type_caster<needle::cpu::AlignedArray> {
 public:
  // the name pybind11 gave the class: signatures read `matmul(a: needle....Array, ...)`
  static constexpr auto name = const_name("needle.backend_ndarray.ndarray_backend_cpu.Array");
  bool load(handle src, bool /*convert*/) {
    if (Py_TYPE(src.ptr()) != &needle::cpu::array_type()) return false;
    value_ = &reinterpret_cast<needle::cpu::ArrayObject*>(src.ptr())->array;
    return true;
  }
  template <typename T>
  using cast_op_type = pybind11::detail::cast_op_type<T>;
  operator needle::cpu::AlignedArray*() { return value_; }
  operator needle::cpu::AlignedArray&() { return *value_; }

 private:
  needle::cpu::AlignedArray* value_ = nullptr;
};
}  // namespace pybind11::detail
