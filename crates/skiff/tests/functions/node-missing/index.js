exports.handler = async () => null;
