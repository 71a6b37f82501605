//! Wire forms of the vocabulary (feature `proto`): layouts to and from
//! their gRPC messages, and how a [`TypesError`] answers a gRPC call.
//!
//! Here rather than in the store because a conversion between a foreign type
//! and a foreign message can only live beside one of them.

use crate::layout::{BlockOrder, DType, KvLayout};
use crate::TypesError;

impl TryFrom<&kvfabric_proto::v1::KvLayout> for KvLayout {
    type Error = TypesError;

    /// A layout from the wire: unknown dtype or order, or a zero dimension, is refused.
    fn try_from(p: &kvfabric_proto::v1::KvLayout) -> Result<Self, TypesError> {
        use kvfabric_proto::v1 as pb;
        let dtype = match pb::DType::try_from(p.dtype) {
            Ok(pb::DType::DtypeF32) => DType::F32,
            Ok(pb::DType::DtypeF16) => DType::F16,
            Ok(pb::DType::DtypeBf16) => DType::BF16,
            _ => {
                return Err(TypesError::InvalidArgument(format!(
                    "unknown layout dtype {}",
                    p.dtype
                )))
            }
        };
        let order = match pb::BlockOrder::try_from(p.order) {
            Ok(pb::BlockOrder::LayerKvTokenHead) => BlockOrder::LayerKvTokenHead,
            Ok(pb::BlockOrder::EnginePage) => BlockOrder::EnginePage,
            _ => {
                return Err(TypesError::InvalidArgument(format!(
                    "unknown layout block order {}",
                    p.order
                )))
            }
        };
        let l = KvLayout {
            layers: p.layers,
            kv_heads: p.kv_heads,
            head_dim: p.head_dim,
            dtype,
            block_tokens: p.block_tokens,
            order,
        };
        l.validate()?;
        Ok(l)
    }
}

impl From<&KvLayout> for kvfabric_proto::v1::KvLayout {
    fn from(l: &KvLayout) -> Self {
        use kvfabric_proto::v1 as pb;
        let dtype = match l.dtype {
            DType::F32 => pb::DType::DtypeF32,
            DType::F16 => pb::DType::DtypeF16,
            DType::BF16 => pb::DType::DtypeBf16,
        };
        let order = match l.order {
            BlockOrder::LayerKvTokenHead => pb::BlockOrder::LayerKvTokenHead,
            BlockOrder::EnginePage => pb::BlockOrder::EnginePage,
        };
        pb::KvLayout {
            layers: l.layers,
            kv_heads: l.kv_heads,
            head_dim: l.head_dim,
            dtype: dtype as i32,
            block_tokens: l.block_tokens,
            order: order as i32,
        }
    }
}

impl From<TypesError> for tonic::Status {
    fn from(e: TypesError) -> Self {
        let msg = e.to_string();
        match e {
            TypesError::InvalidArgument(_) | TypesError::OutOfBounds { .. } => {
                tonic::Status::invalid_argument(msg)
            }
            TypesError::Io { .. } => tonic::Status::internal(msg),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_proto_roundtrip() {
        let l = KvLayout {
            layers: 30,
            kv_heads: 3,
            head_dim: 64,
            dtype: DType::F32,
            block_tokens: 4,
            order: BlockOrder::LayerKvTokenHead,
        };
        let p = kvfabric_proto::v1::KvLayout::from(&l);
        assert_eq!(KvLayout::try_from(&p).unwrap(), l);
        let page = KvLayout {
            order: BlockOrder::EnginePage,
            ..l
        };
        let pp = kvfabric_proto::v1::KvLayout::from(&page);
        assert_eq!(KvLayout::try_from(&pp).unwrap(), page);
        let mut bad = p;
        bad.dtype = 0;
        assert!(KvLayout::try_from(&bad).is_err());
        let mut bad = p;
        bad.order = 7;
        assert!(KvLayout::try_from(&bad).is_err());
        let mut zero = p;
        zero.layers = 0;
        assert!(KvLayout::try_from(&zero).is_err());
    }

    #[test]
    fn bad_input_answers_invalid_argument() {
        let e = crate::BlockKey::from_slice(&[0u8; 3]).unwrap_err();
        assert_eq!(tonic::Status::from(e).code(), tonic::Code::InvalidArgument);
    }
}
