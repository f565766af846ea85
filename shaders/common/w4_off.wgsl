// (This type's decoder reads the weights as u32 words only.)
