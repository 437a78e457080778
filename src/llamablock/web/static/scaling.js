// rope-scaling (15.2): placeholder until llamablock.rope_table lands.
export function setup() {}
