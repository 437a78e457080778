// token-tracer-compare (15.6): placeholder until llamablock.trace lands.
export function setup() {}
