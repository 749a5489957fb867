// Temporaries of a layer call, shared by every layer of one kind on the calling thread.
//
// A model's layers run one at a time on the thread that drives its forward pass, and none of a layer's
// temporaries (projections, activations, expert rows) outlives the call that fills them. So one set per
// layer kind and thread serves every layer of that kind, sized by the largest call seen, where each layer
// held its own before: the activation memory of a prefill chunk no longer grows with the number of layers
// (docs/PERFORMANCE.md, "Activation memory"). Threads that drive forward passes of their own (a second
// model, a cell rank in-process) get their own set. Values that must survive between calls (the KDA and MLA
// caches, a layer's up-projected rows) stay in the layer or the sequence state.
//
// Rules for a user: fetch the set once on the calling thread at the top of the call and pass it (or
// capture the reference) into parallel work; never call shared_temps() from a worker thread, which would
// get that worker's own set.
#pragma once

namespace kestrel {

template <class T>
T& shared_temps() {
  static thread_local T t;
  return t;
}

}  // namespace kestrel
