"""Weight-only int8 / int4: linear weights (and embedding tables) stored as integer codes with
scales, activations in float; sibling layers that read one input stored as one."""
