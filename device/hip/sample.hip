// (family being written)
