// spmd/core/overloaded.h: Overloaded, one callable made of several lambdas.
//
// For std::visit over a variant with one lambda per alternative: an alternative that no lambda
// takes is a compile error, where a generic lambda or an `if constexpr ... else` chain would run
// a fallback in silence (the collective tables, Note [One collective, one options struct]).
//
//   std::visit(Overloaded{[](const AllReduceOptions& o) { ... },
//                         [](const BarrierOptions&) { ... }},
//              options);
#pragma once

namespace spmd {

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

}  // namespace spmd
