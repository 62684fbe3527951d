//! The names of pinboard's own API (`pinboard.dev/v1alpha1`): its group, version and kinds. A leaf, so
//! that set files ([`super::set`]) can accept a PinSet without depending on the API's types.

pub const GROUP: &str = "pinboard.dev";
pub const VERSION: &str = "v1alpha1";
pub const API_VERSION: &str = "pinboard.dev/v1alpha1";
pub const SET_KIND: &str = "PinSet";
pub const SET_PLURAL: &str = "pinsets";
pub const NODE_KIND: &str = "PinboardNode";
pub const NODE_PLURAL: &str = "pinboardnodes";
pub const IMAGES_KIND: &str = "PinboardNodeImages";
pub const IMAGES_PLURAL: &str = "pinboardnodeimages";
pub const BLOBS_KIND: &str = "PinboardNodeBlobs";
pub const BLOBS_PLURAL: &str = "pinboardnodeblobs";
