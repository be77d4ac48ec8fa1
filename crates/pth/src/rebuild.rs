//! The calls a state_dict's pickle makes, each building a value and none running anything
//! (`_rebuild_tensor_v2`/`_v3`, `_rebuild_parameter`, `OrderedDict()`, storages from persistent
//! ids, a dict's `BUILD`); the state_dict read from the result; a tensor view copied out of its
//! storage.
use std::collections::HashMap;
use std::rc::Rc;

use crate::error::FIX;
use crate::limits::MAX_DIMS;
use crate::values::{elem_size, Fail, Global, Obj, Storage, TensorRef, V};
use crate::vm::Vm;

impl<'a> Vm<'a> {
    /// `('storage', torch.FloatStorage, key, location, numel)`.
    pub(crate) fn persistent_load(&self, pid: &V) -> Result<Storage, Fail> {
        const BAD: &str = "a persistent id that is not ('storage', type, key, location, numel)";
        let Some(t) = self.tuple(pid) else {
            return self.corrupt(BAD);
        };
        let [V::Str(kind), V::Global(Global::StorageType(elem)), key, _location, V::Int(numel)] = t
        else {
            return self.corrupt(BAD);
        };
        if &**kind != "storage" {
            return self.corrupt(BAD);
        }
        let key: Rc<str> = match key {
            V::Str(s) => s.clone(),
            V::Int(i) => Rc::from(i.to_string()),
            _ => return self.corrupt(BAD),
        };
        let numel = usize::try_from(*numel).or_else(|_| self.corrupt(BAD))?;
        match numel.checked_mul(elem_size(*elem)) {
            Some(b) if b <= isize::MAX as usize => {}
            _ => return self.corrupt(format!("a storage of {numel} elements")),
        }
        Ok(Storage {
            key,
            elem: *elem,
            numel,
        })
    }

    fn dims(&self, v: &V, what: &str) -> Result<Vec<usize>, Fail> {
        let Some(t) = self.tuple(v) else {
            return self.corrupt(format!("a tensor {what} that is not a tuple"));
        };
        if t.len() > MAX_DIMS {
            return self.corrupt(format!("a tensor of {} dimensions", t.len()));
        }
        t.iter()
            .map(|d| match d {
                V::Int(i) if *i >= 0 => Ok(*i as usize),
                _ => self.corrupt(format!(
                    "a tensor {what} that holds a negative or non-integer"
                )),
            })
            .collect()
    }

    /// The only calls a state_dict's pickle makes; each builds a value, none runs anything.
    pub(crate) fn reduce(&mut self, callable: &V, args: &V) -> Result<V, Fail> {
        // Every call this reader knows takes at most 8 arguments: only those are copied.
        let args: Vec<V> = match self.tuple(args) {
            Some(t) if t.len() <= 8 => t.to_vec(),
            Some(t) => return self.corrupt(format!("REDUCE with {} arguments", t.len())),
            None => return self.corrupt("REDUCE with arguments that are not a tuple"),
        };
        let g = match callable {
            V::Global(g) => *g,
            other => {
                return self.corrupt(format!(
                    "REDUCE of {}, which is not callable",
                    self.describe(other)
                ))
            }
        };
        let tensor =
            |vm: &Self, storage: &V, offset: &V, size: &V, stride: &V, dtype: Option<&V>| {
                let V::Storage(s) = storage else {
                    return vm.corrupt("a tensor without a storage");
                };
                let V::Int(offset) = offset else {
                    return vm.corrupt("a tensor offset that is not an integer");
                };
                let offset =
                    usize::try_from(*offset).or_else(|_| vm.corrupt("a negative offset"))?;
                let size = vm.dims(size, "size")?;
                let stride = vm.dims(stride, "stride")?;
                if size.len() != stride.len() {
                    return vm.corrupt("a tensor with as many sizes as strides");
                }
                let dtype = match dtype {
                    None => s.elem,
                    Some(V::Global(Global::DtypeValue(d))) => *d,
                    Some(_) => return vm.corrupt("a tensor dtype that is not a torch dtype"),
                };
                Ok(V::Tensor(Rc::new(TensorRef {
                    storage: s.clone(),
                    dtype,
                    offset,
                    size,
                    stride,
                })))
            };
        match (g, args.as_slice()) {
            (Global::OrderedDict, []) => {
                self.objs.push(Obj::Dict {
                    items: Vec::new(),
                    by_str: HashMap::new(),
                });
                Ok(V::Obj(self.objs.len() - 1))
            }
            (Global::RebuildTensorV2, [s, o, size, stride, _, _])
            | (Global::RebuildTensorV2, [s, o, size, stride, _, _, _])
            | (Global::RebuildTensor, [s, o, size, stride]) => {
                tensor(self, s, o, size, stride, None)
            }
            (Global::RebuildTensorV3, [s, o, size, stride, _, _, d])
            | (Global::RebuildTensorV3, [s, o, size, stride, _, _, d, _]) => {
                tensor(self, s, o, size, stride, Some(d))
            }
            (Global::RebuildParameter, [t @ V::Tensor(_), _, _])
            | (Global::RebuildParameterWithState, [t @ V::Tensor(_), _, _, _]) => Ok(t.clone()),
            (Global::StorageType(_) | Global::DtypeValue(_), _) => {
                self.corrupt("REDUCE of a tensor type, which is not callable")
            }
            (g, args) => self.corrupt(format!(
                "REDUCE of {g:?} with {} arguments it does not take",
                args.len()
            )),
        }
    }

    /// BUILD: a dict's state (the `_metadata` that `state_dict()` sets) is accepted and
    /// ignored; nothing else is built.
    pub(crate) fn build(&mut self, state: &V) -> Result<(), Fail> {
        let target_is_dict = matches!(
            self.stack.last(),
            Some(V::Obj(i)) if matches!(self.objs.get(*i), Some(Obj::Dict { .. }))
        );
        let state_ok = match state {
            V::None => true,
            V::Obj(i) => matches!(self.objs.get(*i), Some(Obj::Dict { .. } | Obj::Tuple(_))),
            _ => false,
        };
        if target_is_dict && state_ok {
            Ok(())
        } else {
            self.corrupt("BUILD of something other than a dict's attributes")
        }
    }

    pub(crate) fn dict_items(&self, v: &V) -> Option<&[(V, V)]> {
        match v {
            V::Obj(i) => match self.objs.get(*i) {
                Some(Obj::Dict { items, .. }) => Some(items),
                _ => None,
            },
            _ => None,
        }
    }

    /// The pickled object as a state_dict: a dict of name -> tensor, in order. A checkpoint
    /// dict holding a state_dict is named as such, with the entry to save.
    pub(crate) fn state_dict(&self, root: &V) -> Result<Vec<(String, Rc<TensorRef>)>, Fail> {
        let Some(items) = self.dict_items(root) else {
            return Err(Fail::NotAStateDict(format!(
                "it holds {}; {FIX}",
                self.describe(root)
            )));
        };
        if items.is_empty() {
            return Err(Fail::NotAStateDict(format!(
                "it holds an empty dict; {FIX}"
            )));
        }
        let mut out = Vec::with_capacity(items.len());
        for (k, v) in items {
            let V::Str(name) = k else {
                return Err(Fail::NotAStateDict(format!(
                    "it holds a dict with {} key; {FIX}",
                    self.describe(k)
                )));
            };
            match v {
                V::Tensor(t) => out.push((name.to_string(), t.clone())),
                other => {
                    let nested = items.iter().find_map(|(k, v)| {
                        let inner = self.dict_items(v)?;
                        let all_tensors = !inner.is_empty()
                            && inner
                                .iter()
                                .all(|(k, v)| matches!((k, v), (V::Str(_), V::Tensor(_))));
                        match (k, all_tensors) {
                            (V::Str(k), true) => Some((k.clone(), inner.len())),
                            _ => None,
                        }
                    });
                    return Err(Fail::NotAStateDict(match nested {
                        Some((key, n)) => format!(
                            "it holds a checkpoint (entry '{name}' is {}) whose entry '{key}' is \
                             a dict of {n} tensors: save that entry alone, \
                             torch.save(checkpoint['{key}'], PATH), and give that file",
                            self.describe(other)
                        ),
                        None => format!(
                            "entry '{name}' is {}, not a tensor; {FIX}",
                            self.describe(other)
                        ),
                    }));
                }
            }
        }
        Ok(out)
    }
}

impl TensorRef {
    /// The view as a contiguous little-endian copy, checked against its storage (`storage`:
    /// the archive entry's bytes).
    pub(crate) fn contiguous(&self, storage: &[u8]) -> Result<Vec<u8>, String> {
        let es = elem_size(self.dtype);
        let storage_bytes = self.storage.numel * elem_size(self.storage.elem);
        if storage.len() < storage_bytes {
            return Err(format!(
                "its storage data/{} holds {} bytes, {storage_bytes} expected",
                self.storage.key,
                storage.len()
            ));
        }
        let view = || {
            format!(
                "its view (offset {}, size {:?}, stride {:?})",
                self.offset, self.size, self.stride
            )
        };
        // Empty whatever its other sizes (the product must not overflow on the way to 0).
        if self.size.contains(&0) {
            return Ok(Vec::new());
        }
        let numel = self
            .size
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| format!("{} has too many elements", view()))?;
        // The last element the view reaches; within the storage, with no more elements than
        // the storage holds (broadcast views are refused: they would multiply the data).
        let last = self
            .size
            .iter()
            .zip(&self.stride)
            .try_fold(self.offset, |a, (&n, &s)| {
                a.checked_add((n - 1).checked_mul(s)?)
            });
        let fits = |elems: usize| elems.checked_mul(es).is_some_and(|b| b <= storage_bytes);
        match last {
            Some(last) if last.checked_add(1).is_some_and(fits) && fits(numel) => {}
            _ => {
                return Err(format!(
                    "{} needs more than its storage's {storage_bytes} bytes",
                    view()
                ))
            }
        }
        let mut out = Vec::with_capacity(numel * es);
        let nd = self.size.len();
        if nd == 0 {
            out.extend_from_slice(&storage[self.offset * es..(self.offset + 1) * es]);
            return Ok(out);
        }
        // Row by row over the last dimension, an odometer over the others.
        let (inner, inner_stride) = (self.size[nd - 1], self.stride[nd - 1]);
        let mut idx = vec![0usize; nd - 1];
        for _ in 0..numel / inner {
            let base = self.offset
                + idx
                    .iter()
                    .zip(&self.stride)
                    .map(|(i, s)| i * s)
                    .sum::<usize>();
            if inner_stride == 1 {
                out.extend_from_slice(&storage[base * es..(base + inner) * es]);
            } else {
                for j in 0..inner {
                    let e = base + j * inner_stride;
                    out.extend_from_slice(&storage[e * es..(e + 1) * es]);
                }
            }
            for d in (0..nd - 1).rev() {
                idx[d] += 1;
                if idx[d] < self.size[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        Ok(out)
    }
}
